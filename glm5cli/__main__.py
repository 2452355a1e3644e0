from glm5cli.app import main

main()
